"""The online family on one loop: PPO (``ppo``) and the critic-free estimators (``grpo``).

Where a change goes: a config field shared by both in ``config``; loading or placing a role
(actor, reference, critic, reward) in ``roles``; sampling, scoring and the forward passes of
a rollout in ``rollout``; DAPO's dynamic sampling rounds and truncated-response mask in
``dapo``; the minibatch loss and optimizer steps in ``update``; a kind of
critic (how it computes values, trains, checkpoints and saves) in ``critic``; the iteration
itself (schedule, controllers, checkpoints, metrics) in ``loop``; an algorithm's own choices
(advantage estimator, policy loss, critic) in its file.
"""
