"""The online family on one loop: PPO (``ppo``) and the critic-free estimators (``grpo``).

Where a change goes:
- a config field shared by both: ``config`` (placement's: ``placement_fields``; held-out
  evaluation's: ``heldout_fields``); an algorithm's own choices (estimator, policy loss,
  critic): its file, registered in its table;
- the way in (the config and output directory checked, then the placement runs the driver):
  ``launch``; the iteration's order of stages: ``loop``; what a run holds and how it opens
  (roles, optimizers, checkpoint, resume): ``run``;
- the rollout's stages (sample → score → forward passes): ``collect``; joining several
  processes' rows: ``gather``; the prompt schedule: ``prompts``; DAPO's dynamic sampling and
  truncated-response mask: ``dapo``; advantages, once per iteration: ``advantages``;
- the minibatch loss and optimizer steps: ``update``; a kind of critic: ``critic``;
- loading or placing a role (actor, reference, critic, reward): ``roles``; where roles run:
  ``placement`` (``base``: the interface and this process; ``ray_*``: Ray actors);
- a sampler: one engine in ``rollout.engines`` and one line in ``samplers.ENGINES``.
"""
