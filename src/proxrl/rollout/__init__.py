"""Online RL plumbing: sampling responses, scoring them, and the rollout record."""
