"""Multi-turn episodes through vLLM, token in / token out: each model turn holds exactly the ids
the engine returned (fed back to it as ids, never as text), and the trainer's log-probs of
every model token equal the engine's."""

from __future__ import annotations

import torch

from proxrl.models.tokenizer import load_tokenizer
from proxrl.rollout.environment import Turn
from proxrl.rollout.forward import policy_forward
from proxrl.rollout.generation import SamplingSettings
from proxrl.rollout.multiturn import EpisodeLimits, run_episodes
from proxrl.rollout.vllm_sampler import EngineOptions, VLLMSampler, sync_weights

WORDS = ["abc", "def", "ghi", "jkl"]


class TwoTurns:
    tools: list = []

    def reset(self, row):
        self.turns = 0

    def step(self, completion):
        self.turns += 1
        if self.turns == 1:
            return Turn([{"role": "user", "content": "again:"}])
        return Turn([], reward=len(completion) / 10, done=True)


class Recording:
    def __init__(self, sampler):
        self.sampler, self.calls = sampler, []

    def sample(self, prompt_ids, prompt_mask, settings, with_logprobs=False):
        self.calls.append((prompt_ids, prompt_mask))
        out = self.sampler.sample(prompt_ids, prompt_mask, settings, with_logprobs)
        self.calls[-1] += (out,)
        return out


def test_vllm_episodes_are_token_in_token_out(tiny_lm, engines):
    from transformers import AutoModelForCausalLM

    engine = engines.get(EngineOptions(tiny_lm, gpu_memory_utilization=0.02)).llm
    tokenizer = load_tokenizer(tiny_lm)
    model = AutoModelForCausalLM.from_pretrained(tiny_lm, dtype=torch.float32)
    sync_weights(engine, model)
    conversations = [[{"role": "user", "content": f"say: {w} ->"}] for w in WORDS]
    ids = [
        tokenizer(tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True))[
            "input_ids"
        ]
        for c in conversations
    ]
    width = max(map(len, ids))
    prompt = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in ids])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ids])
    sampler = Recording(VLLMSampler(engine, tokenizer))
    torch.manual_seed(0)
    ep = run_episodes(
        sampler,
        tokenizer,
        [TwoTurns() for _ in WORDS],
        [{}] * len(WORDS),
        conversations,
        prompt,
        mask,
        SamplingSettings(8, temperature=1.0),
        EpisodeLimits(2, 64),
        with_logprobs=True,
    )
    (_, _, first), (second_prompt, second_mask, second) = sampler.calls
    for i in range(len(WORDS)):
        turn1 = first.response_ids[i, : int(first.response_mask[i].sum())].tolist()
        assert ep.response_ids[i, : len(turn1)].tolist() == turn1
        # the second request is the prompt and the whole episode so far, as ids
        context = second_prompt[i][second_mask[i].bool()].tolist()
        length = int(ep.response_mask[i].sum())
        turn2 = second.response_ids[i, : int(second.response_mask[i].sum())].tolist()
        assert context + turn2 == ids[i] + ep.response_ids[i, :length].tolist()
    with torch.no_grad():
        trainer = policy_forward(
            model,
            torch.cat([prompt, ep.response_ids], 1),
            torch.cat([mask, ep.response_mask], 1),
            prompt.shape[1],
            1.0,
        ).logprobs
    actions = ep.action_mask.bool()
    assert int(actions.sum()) >= 20 and bool((~actions & ep.response_mask.bool()).any())
    torch.testing.assert_close(ep.logprobs[actions], trainer[actions], rtol=0, atol=1e-4)
