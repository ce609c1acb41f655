"""One PPO iteration of proxrl against its bare-compute floor, on a fixed tiny model.

The floor is the same model work done in a plain torch loop with nothing around it: a bare
KV-cache decoding loop, the policy, reference and critic forward passes over the rollout, and
ppo_epochs × minibatches of policy and critic forward + backward + AdamW step. The ratio
(proxrl iteration / floor) is the framework's overhead. Both run in this process, interleaved
A B A B, so machine noise hits both alike.

    .venv/bin/python benchmarks/rl_throughput.py --hidden 256 --layers 4 --iterations 6
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "algos"))
from lm_tasks import CORPUS  # noqa: E402

from proxrl.algos.online import ppo  # noqa: E402
from proxrl.core import logprobs_from_logits, ppo_clip_loss, value_loss  # noqa: E402
from proxrl.models.scalar_head import load_score_model  # noqa: E402
from proxrl.models.tiny import build_tiny_lm  # noqa: E402
from proxrl.rollout.forward import critic_forward, position_ids  # noqa: E402
from proxrl.rollout.generation import draw_tokens  # noqa: E402
from proxrl.runtime.metrics import read_metrics  # noqa: E402


def letter_share(prompts: list[str], completions: list[str], **columns: list) -> list[float]:
    return [sum(ch in "abcdefghijklm" for ch in c) / max(len(c), 1) for c in completions]


def bare_decode(model, prompt_ids, prompt_mask, max_new_tokens, temperature, eos):
    """The least a sampler can do: prefill, then one cached forward and one draw per token (the
    cheapest proxrl has, ``draw_tokens``) until every row has said EOS."""
    attention = prompt_mask.clone()
    positions = (attention.cumsum(-1) - 1).clamp_min(0)
    output = model(
        input_ids=prompt_ids,
        attention_mask=attention,
        position_ids=positions,
        use_cache=True,
        logits_to_keep=1,
    )
    cache, logits, step = output.cache, output.logits[:, -1], positions[:, -1:] + 1
    done = torch.zeros(prompt_ids.shape[0], dtype=torch.bool)
    tokens = []
    for _ in range(max_new_tokens):
        token = draw_tokens(torch.softmax(logits / temperature, -1))
        tokens.append(token)
        done |= token == eos
        if done.all():
            break
        attention = torch.cat([attention, torch.ones_like(attention[:, :1])], 1)
        output = model(
            input_ids=token[:, None],
            attention_mask=attention,
            position_ids=step,
            cache=cache,
            use_cache=True,
        )
        cache, logits, step = output.cache, output.logits[:, -1], step + 1
    return torch.cat([prompt_ids, torch.stack(tokens, 1)], 1)


def floor_iteration(model, ref, critic, tokenizer, prompt_ids, prompt_mask, cfg) -> float:
    """The same calls as one proxrl PPO iteration, in a bare loop. Returns seconds."""
    started = time.perf_counter()
    with torch.no_grad():
        out = bare_decode(
            model,
            prompt_ids,
            prompt_mask,
            cfg.max_new_tokens,
            cfg.temperature,
            tokenizer.eos_token_id,
        )
        ids = out
        mask = torch.ones_like(ids)
        P = prompt_ids.shape[1]
        mask[:, :P] = prompt_mask
        pos = position_ids(mask)
        old = logprobs_from_logits(
            model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, P - 1 : -1],
            ids[:, P:],
            cfg.temperature,
        )
        logprobs_from_logits(
            ref(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, P - 1 : -1],
            ids[:, P:],
            cfg.temperature,
        )
        old_values = critic_forward(critic, ids, mask, P)
    advantages = torch.randn_like(old)
    returns = torch.randn_like(old)
    response_mask = torch.ones_like(old)
    actor_opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    critic_opt = torch.optim.AdamW(critic.parameters(), lr=1e-6)
    for _ in range(cfg.ppo_epochs):
        for rows in torch.randperm(ids.shape[0]).split(cfg.mini_batch_size):
            logits = model(
                input_ids=ids[rows], attention_mask=mask[rows], position_ids=pos[rows]
            ).logits[:, P - 1 : -1]
            new = logprobs_from_logits(logits, ids[rows, P:], cfg.temperature)
            loss = ppo_clip_loss(new, old[rows], advantages[rows], response_mask[rows])[0]
            values = critic_forward(critic, ids[rows], mask[rows], P)
            loss = (
                loss
                + 0.1
                * value_loss(values, old_values[rows], returns[rows], response_mask[rows], 0.2)[0]
            )
            loss.backward()
            actor_opt.step()
            critic_opt.step()
            actor_opt.zero_grad()
            critic_opt.zero_grad()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument(
        "--iterations", type=int, default=6, help="proxrl iterations per run (the first is warm-up)"
    )
    parser.add_argument("--pairs", type=int, default=3, help="A/B pairs")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.getLogger("transformers").setLevel(logging.ERROR)

    work = Path(tempfile.mkdtemp(prefix="rl_throughput_"))
    model_dir = build_tiny_lm(
        work / "lm",
        CORPUS,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=max(args.hidden // 64, 2),
    )
    prompts = work / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in ["abc", "def", "ghi", "jkl"] * 8
        )
    )
    sys.modules.setdefault("rl_throughput", sys.modules["__main__"])
    base = dict(
        model=str(model_dir),
        prompts=str(prompts),
        reward_fn=("rl_throughput:letter_share",),
        iterations=args.iterations,
        rollout_batch_size=16,
        group_size=2,
        max_new_tokens=32,
        temperature=1.0,
        ppo_epochs=2,
        mini_batch_size=16,
        learning_rate=1e-6,
        progress=False,
        overwrite=True,
        sample_every=0,
        no_stop_penalty=None,
    )

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ref = AutoModelForCausalLM.from_pretrained(model_dir).requires_grad_(False)
    critic = load_score_model(str(model_dir), new_head="zero")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    batch = tokenizer(
        [f"say: {w} ->" for w in ["abc", "def", "ghi", "jkl"] * 8],
        return_tensors="pt",
        padding=True,
    )

    proxrl_rows, floor_s = [], []
    for pair in range(args.pairs):
        out = work / f"run{pair}"
        ppo.train(ppo.Config(**base, output_dir=str(out)))
        proxrl_rows.extend(read_metrics(out)[1:])
        floor_s.extend(
            floor_iteration(
                model,
                ref,
                critic,
                tokenizer,
                batch.input_ids,
                batch.attention_mask,
                ppo.Config(**base),
            )
            for _ in range(args.iterations - 1)
        )

    def med(key: str) -> float:
        return statistics.median(r[key] for r in proxrl_rows)

    iteration_s = med("time/iteration_s")
    tokens = statistics.median(r["response/length_mean"] for r in proxrl_rows) * 32
    floor = statistics.median(floor_s)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"model: hidden {args.hidden} × {args.layers} layers; 32 responses × 32 new tokens; "
        f"2 PPO epochs × 2 minibatches; {args.threads} threads"
    )
    print(f"{'phase':<12} {'proxrl median s':>16}")
    for phase in ("rollout", "score", "forward", "update"):
        print(f"{phase:<12} {med(f'time/{phase}_s'):>16.3f}")
    print(
        f"{'iteration':<12} {iteration_s:>16.3f}   floor {floor:.3f} s   "
        f"ratio proxrl/floor {iteration_s / floor:.2f}"
    )
    print(f"generated tokens/s (proxrl): {tokens / iteration_s:.0f}   peak RSS {peak_mb:.0f} MB")


if __name__ == "__main__":
    main()
