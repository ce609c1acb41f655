"""Rollouts from elsewhere on the demo's task (issue 38): a generator written with `transformers`
alone writes the rollouts file from the current policy every iteration, and a
`proxrl.TrainingClient` loop trains GRPO on it (`read_rollouts` → `logprobs(recorded=True)`);
compared with the same loop sampling on-policy through proxrl's own engine.

    # once: the demo's data and SFT policy (the demo's own functions, seed 1)
    PROXRL_NUM_THREADS=1 python benchmarks/external_rollouts.py prepare --out /tmp/extroll
    # one run: mode onpolicy | file; --stale K trains at iteration i on the file written by the
    # policy of iteration max(0, i - K) (K = 0: refreshed every iteration)
    PROXRL_NUM_THREADS=1 python benchmarks/external_rollouts.py run --out /tmp/extroll \
        --mode file --stale 4 --correction tis --seed 1

Each run prints one JSON line: held-out gold (exact accuracy on the demo's 200 evaluation
prompts × 4 samples at temperature 1), the SFT policy's gold, the last iterations' training
score. Budget (both modes the same): the demo's GRPO settings (32 prompts × 4 responses,
max_new_tokens 4, lr 5e-4, 2 epochs of one minibatch, kl_coef 0) with `lr_schedule: constant`
and `--iterations` iterations.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

GROUP_SIZE, PROMPTS_PER_ITERATION, MAX_NEW_TOKENS, TEMPERATURE = 4, 32, 4, 1.0


def write_rollouts_with_transformers(
    model: torch.nn.Module,
    tokenizer,
    prompts: list[str],
    group_size: int,
    score: Callable[[list[str], list[str]], list[float]],
    path: Path,
    seed: int,
) -> None:
    """The external harness: transformers' `generate` samples `group_size` responses per prompt
    (the processed scores' log-softmax is each token's log-probability), `score` rates them, and
    the rollouts file is written to a temporary name and renamed over `path`. No proxrl here."""
    lines = []
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)
        for group, text in enumerate(prompts):
            ids = tokenizer(text, return_tensors="pt").input_ids
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=TEMPERATURE,
                top_k=0,
                top_p=1.0,
                max_new_tokens=MAX_NEW_TOKENS,
                num_return_sequences=group_size,
                output_scores=True,
                return_dict_in_generate=True,
                pad_token_id=tokenizer.pad_token_id,
            )
            steps = torch.stack(out.scores, 1).float().log_softmax(-1)  # (G, T, V)
            for row in range(group_size):
                response = out.sequences[row, ids.shape[1] :].tolist()
                if tokenizer.eos_token_id in response:  # up to and including the stop token
                    response = response[: response.index(tokenizer.eos_token_id) + 1]
                lines.append(
                    {
                        "prompt_ids": ids[0].tolist(),
                        "response_ids": response,
                        "logprobs": [float(steps[row, t, tok]) for t, tok in enumerate(response)],
                        "group": group,
                        "response": tokenizer.decode(response, skip_special_tokens=True),
                    }
                )
    rewards = score([prompts[line["group"]] for line in lines], [row["response"] for row in lines])
    for line, reward in zip(lines, rewards, strict=True):
        line["reward"] = reward
    partial = path.with_suffix(".tmp")
    partial.write_text("".join(json.dumps(line) + "\n" for line in lines))
    os.replace(partial, path)


def prepare(out: Path) -> None:
    """The demo's data, tiny base model and SFT policy, with the demo's own functions."""
    from proxrl.algos.offline import sft
    from proxrl.demo import pipeline, task
    from proxrl.models.tiny import build_tiny_lm

    cfg = pipeline.Config(output_dir=str(out), progress=False)
    torch.set_num_threads(1)
    data = task.generate(out / "data", cfg.task_sizes, cfg.seed)
    build_tiny_lm(
        out / "base",
        task.tokenizer_corpus(),
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        vocab_size=300,
        max_positions=64,
        seed=cfg.seed,
    )
    sft.train(pipeline.sft_config(cfg, out, data["sft"]))


def held_out_gold(model: torch.nn.Module, tokenizer, prompts: list[str], samples: int = 4) -> float:
    """Exact accuracy of `samples` responses per held-out prompt (fixed sampling seed)."""
    from proxrl.demo.task import is_correct

    correct = []
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(12345)
        for text in prompts:
            ids = tokenizer(text, return_tensors="pt").input_ids
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=TEMPERATURE,
                top_k=0,
                top_p=1.0,
                max_new_tokens=MAX_NEW_TOKENS,
                num_return_sequences=samples,
                pad_token_id=tokenizer.pad_token_id,
            )
            texts = tokenizer.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)
            correct += [is_correct(text, c) for c in texts]
    return sum(correct) / len(correct)


def read_prompts(path: Path) -> list[str]:
    return [json.loads(line)["prompt"] for line in path.read_text().splitlines() if line]


def run(args: argparse.Namespace) -> dict:
    import proxrl
    from proxrl.core import REWARD_SCALES
    from proxrl.demo.task import gold

    out = Path(args.out)
    name = f"{args.mode}_stale{args.stale}_{args.correction}_seed{args.seed}"
    work = out / "runs" / name
    work.mkdir(parents=True, exist_ok=True)
    prompts = read_prompts(out / "data" / "rl_prompts.jsonl")
    client = proxrl.TrainingClient(
        str(out / "sft"),
        group_size=GROUP_SIZE,
        mini_batch_size=PROMPTS_PER_ITERATION * GROUP_SIZE,
        max_new_tokens=MAX_NEW_TOKENS,
        temperature=TEMPERATURE,
        learning_rate=5e-4,
        lr_schedule="constant",
        kl_coef=0.0,
        rollout_correction=args.correction,
        seed=args.seed,
        output_dir=str(work),
        progress=False,
    )
    policy, tokenizer = client.model, client.tokenizer
    eval_prompts = read_prompts(out / "data" / "eval_prompts.jsonl")[: args.eval_prompts]
    sft_gold = held_out_gold(policy, tokenizer, eval_prompts)
    behaviour = copy.deepcopy(policy).eval()  # the harness's own copy of the weights
    snapshots = [copy.deepcopy(policy.state_dict())]  # policy after iteration i: snapshots[i]
    path = work / "rollouts.jsonl"
    train_scores, started = [], time.time()
    for iteration in range(args.iterations):
        chosen = [prompts[i] for i in client.prompt_batch(len(prompts), 32, iteration)]
        if args.mode == "onpolicy":
            rollout = client.sample(chosen, n=GROUP_SIZE)
            batch = client.logprobs(rollout, torch.tensor(gold(rollout.prompts, rollout.text)))
        else:
            behaviour.load_state_dict(snapshots[max(0, iteration - args.stale)])
            seed = args.seed * 100_003 + iteration
            write_rollouts_with_transformers(
                behaviour, tokenizer, chosen, GROUP_SIZE, gold, path, seed
            )
            batch = client.logprobs(client.read_rollouts(path), recorded=True)
        advantages = REWARD_SCALES["group"](batch.scores, GROUP_SIZE)
        batch = replace(batch, advantages=advantages[:, None] * batch.loss_mask.float())
        for _epoch in range(2):  # the demo's ppo_epochs, one minibatch each
            for rows in client.minibatches(len(batch)):
                client.forward_backward(batch.select(rows), loss="ppo")
                client.optim_step()
        train_scores.append(float(batch.scores.mean()))
        if args.mode == "file":
            snapshots.append(copy.deepcopy(policy.state_dict()))
            snapshots[: max(0, len(snapshots) - args.stale - 1)] = [None] * max(
                0, len(snapshots) - args.stale - 1
            )
    policy.eval()
    result = {
        "run": name,
        "iterations": args.iterations,
        "gold": held_out_gold(policy, tokenizer, eval_prompts),
        "sft_gold": sft_gold,
        "train_score_last5": sum(train_scores[-5:]) / len(train_scores[-5:]),
        "seconds": round(time.time() - started, 1),
    }
    print(json.dumps(result), flush=True)
    with (out / "results.jsonl").open("a") as f:
        f.write(json.dumps(result) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=("prepare", "run"))
    parser.add_argument("--out", default="/tmp/extroll")
    parser.add_argument("--mode", choices=("onpolicy", "file"), default="file")
    parser.add_argument("--stale", type=int, default=0)
    parser.add_argument("--correction", default="none")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--eval-prompts", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.stage == "prepare":
        prepare(Path(args.out))
    else:
        run(args)


if __name__ == "__main__":
    main()
