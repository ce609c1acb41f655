"""A value head on the policy's own backbone: the critic that shares the actor's body."""

from __future__ import annotations

from torch import Tensor, nn

from proxrl.models.scalar_head import apply_head


class ValueHead(nn.Module):
    """V(s) = w·h + b on the policy's last hidden state (the shared-backbone critic),
    zero-initialised."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        return apply_head(self.linear, hidden).squeeze(-1).float()
