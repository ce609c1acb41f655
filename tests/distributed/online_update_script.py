"""Run one online update phase on a saved rollout, on 1 process (python) or N (torchrun).

    python online_update_script.py make   ALGO MODEL PROMPTS OUT  # rollout → OUT/experience.pt
    python online_update_script.py update ALGO MODEL PROMPTS OUT  # update → OUT/weights.safetensors
    ... [key=value ...]  # config overrides (grad_accum=2, loss_aggregation=token-mean); on
                         # make, ragged=1 cuts the responses to very unequal lengths
    ... update ... -- update ...  # several jobs, one after the other, in one launch (the
                                  # ranks' start-up, seconds of CPU each, paid once)

``update`` builds the models and optimizers as ``train_online`` does (seeded; on several
processes the update sums gradients over ranks; under FSDP the models are sharded first),
loads the same rollout on every rank, runs ``online_update.update`` and has rank 0 save the
actor and critic weights (gathered whole) and the stats, as ``world{N}[_fsdp].safetensors``."""

from __future__ import annotations

import json
import sys
from dataclasses import fields, replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from proxrl.algos.online import grpo, ppo
from proxrl.algos.online.advantages import estimate
from proxrl.algos.online.collect import collect_rollout
from proxrl.algos.online.roles import load_models, load_prompts, load_rewards, role_settings
from proxrl.algos.online.run_settings import run_settings
from proxrl.algos.online.samplers import make_engine
from proxrl.algos.online.update import UpdateStep, update
from proxrl.rollout.experience import Experience
from proxrl.runtime import distributed as dist
from proxrl.runtime import fsdp
from proxrl.runtime.guard import NonFiniteGuard
from proxrl.runtime.seeding import seed_everything

RAGGED = [8, 1, 2, 2, 1, 7, 3, 1]  # response lengths imposed by ragged=1, repeated over rows


def config(name: str, model: str, prompts: str, out: str, overrides: dict | None = None):
    common = dict(
        model=model,
        prompts=prompts,
        reward_fn=("tests.algos.online_rewards:target_fraction",),
        output_dir=out,
        max_new_tokens=8,
        temperature=1.0,
        learning_rate=3e-3,
        dtype="float64",
        progress=False,
        seed=3,
        ppo_epochs=2,
        mini_batch_size=8,
        grad_accum=4,
        shared_prefix=False,  # one process against two: the same forward on every batching
        max_tokens_per_micro_batch=0,  # the splits compared are grad_accum's padded ones
    )
    common |= overrides or {}
    if name == "ppo":
        return ppo, ppo.Config(
            **(
                dict(rollout_batch_size=8, group_size=2, critic_learning_rate=1e-3, kl_coef=0.05)
                | common
            )
        )
    return grpo, grpo.Config(
        **(dict(rollout_batch_size=4, group_size=4, estimator="grpo", kl_coef=0.05) | common)
    )


def _ragged(experience: Experience) -> Experience:
    """The rollout with response i cut to RAGGED[i % 8] tokens (advantages and returns 0 after)."""
    B, T = experience.response_mask.shape
    lengths = torch.tensor([RAGGED[i % len(RAGGED)] for i in range(B)]).clamp_max(T)
    keep = torch.arange(T)[None, :] < lengths[:, None]
    mask = experience.response_mask * keep
    return replace(
        experience,
        response_mask=mask,
        advantages=experience.advantages * mask,
        returns=experience.returns * mask,
    )


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main(mode: str, name: str, model: str, prompts_path: str, out: str, *extra: str) -> None:
    overrides = {k: _value(v) for k, v in (item.split("=", 1) for item in extra)}
    ragged = overrides.pop("ragged", 0)
    if "teacher_model" in overrides:  # a directory under OUT (a path would name the files)
        overrides["teacher_model"] = str(Path(out) / overrides["teacher_model"])
    module, cfg = config(name, model, prompts_path, out, overrides)
    algo = module.build(cfg)
    seed_everything(cfg.seed)
    models = load_models(role_settings(cfg).models, algo)
    if mode == "make":
        prompts, ids = load_prompts(role_settings(cfg).prompts, models.tokenizer)
        experience, _, _ = collect_rollout(
            run_settings(cfg, algo, models.critic).collecting,
            algo,
            models,
            load_rewards(role_settings(cfg).rewards),
            prompts[: cfg.rollout_batch_size],
            ids[: cfg.rollout_batch_size],
            0.05,
            {},
            make_engine(role_settings(cfg).engine, models.tokenizer),
        )
        experience = estimate(algo, experience, 0.05, cfg)  # (with a teacher: its term)
        if ragged:
            experience = _ragged(experience)
        torch.save(
            {f.name: getattr(experience, f.name) for f in fields(experience)},
            Path(out) / "experience.pt",
        )
        return
    experience = Experience(**torch.load(Path(out) / "experience.pt", weights_only=True))
    if getattr(cfg, "positive_nll_coef", None):  # ppo: the estimate tells the loss the positives
        experience = estimate(algo, experience, 0.05)
    train_models = models
    if dist.is_sharded():  # as train_online: shard first (in place), then build the optimizers
        train_models = replace(
            models,
            actor=dist.wrap_model(models.actor),
            critic=models.critic.wrapped(dist.wrap_model),
        )
    optimizers = [
        torch.optim.AdamW(
            [p for p in models.actor.parameters() if p.requires_grad],
            lr=cfg.learning_rate,
            weight_decay=0.0,
        ),
        *models.critic.optimizers(),
    ]
    stats = update(
        run_settings(cfg, algo, train_models.critic).updating,
        algo,
        train_models,
        experience,
        optimizers,
        UpdateStep(0.05, True, 1),
        torch.Generator().manual_seed(cfg.seed),
        NonFiniteGuard(),
    )
    held = {  # the share of each model's weights this rank holds: 1/world under FSDP
        name: sum(p.to_local().numel() if fsdp.is_dtensor(p) else p.numel() for p in params)
        / sum(p.numel() for p in params)
        for name, params in (
            ("actor", list(models.actor.parameters())),
            ("critic", list(models.critic.parameters())),
        )
        if params  # grpo: no critic
    }
    actor, critic = (dist.full_state(m.state_dict()) for m in (models.actor, models.critic))
    if dist.is_main():
        tag = f"world{dist.world_size()}" + "".join(f"_{item}" for item in extra)
        tag += "_fsdp" if dist.is_sharded() else ""
        weights = {f"actor.{k}": v.contiguous() for k, v in actor.items()}
        weights |= {f"critic.{k}": v.contiguous() for k, v in critic.items()}
        save_file(weights, str(Path(out) / f"{tag}.safetensors"))
        (Path(out) / f"{tag}.json").write_text(json.dumps(stats))
        (Path(out) / f"{tag}_held.json").write_text(json.dumps(held))
    dist.barrier()


def jobs(argv: list[str]) -> list[list[str]]:
    """The command line's jobs: ``main``'s arguments, separated by ``--``."""
    split: list[list[str]] = [[]]
    for item in argv:
        if item == "--":
            split.append([])
        else:
            split[-1].append(item)
    return [job for job in split if job]


if __name__ == "__main__":
    for job in jobs(sys.argv[1:]):
        main(*job)
    # As cli.main: a rank that ran FSDP2 ends without C++ teardown (runtime.distributed).
    dist.end_launched_process(0)
