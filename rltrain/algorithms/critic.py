"""A value model for PPO: a causal-LM backbone with a scalar head on its last hidden state."""

from __future__ import annotations

from torch import Tensor, nn

from rltrain.algorithms.logprobs import position_ids_from_mask


class ValueModel(nn.Module):
    """``V(s_t)`` for every position, from any Hugging Face causal LM used as a backbone.

    The head starts at zero, so a fresh critic predicts 0 everywhere and the first advantages
    are the returns themselves.
    """

    def __init__(self, backbone: nn.Module) -> None:
        """Wrap ``backbone`` (its LM head is unused) with a zero-initialised value head.

        Args:
            backbone: a Hugging Face causal LM (``config.hidden_size`` is read).
        """
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.config.hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Values at every position.

        Args:
            input_ids: ``[B, T]``.
            attention_mask: ``[B, T]``.

        Returns:
            ``[B, T]`` float values.
        """
        out = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
            output_hidden_states=True,
            use_cache=False,
        )
        return self.head(out.hidden_states[-1].float()).squeeze(-1)


def compute_values(
    critic: ValueModel, input_ids: Tensor, attention_mask: Tensor, response_mask: Tensor
) -> Tensor:
    """Values of the state before each response token.

    Args:
        critic: the value model.
        input_ids: ``[B, P + R]``.
        attention_mask: ``[B, P + R]``.
        response_mask: ``[B, R]``.

    Returns:
        ``[B, R]`` values, zero outside the mask.
    """
    r = response_mask.shape[1]
    v = critic(input_ids, attention_mask)[:, -r - 1 : -1]
    return v * response_mask.float()
