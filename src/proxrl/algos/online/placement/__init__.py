"""Where the roles of an online run live: ``placement: local`` (every role in this process) or
``placement: ray`` (each role a Ray actor: ``ray_roles``, started by ``ray_run``).

The loop asks its ``Roles`` for the reward sources and the models, and tells them when it
starts, before and after each update; it never asks which placement it has.
"""
