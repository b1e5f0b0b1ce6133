"""A value model for PPO: a causal-LM backbone with a scalar head on its last hidden state."""

from __future__ import annotations

from torch import Tensor, nn

from rltrain.algorithms.logprobs import position_ids_from_mask


def language_model_trunk(model: nn.Module) -> nn.Module:
    """The transformer under a causal LM's head (``LlamaForCausalLM.model``), or ``model`` itself.

    A value model needs hidden states, not vocabulary logits: dropping the LM head saves its
    parameters and the ``[B, T, V]`` logits, and leaves no parameter without a gradient (which
    DistributedDataParallel would wait for).
    """
    prefix = getattr(model, "base_model_prefix", "")
    trunk = getattr(model, prefix, None) if prefix else None
    return trunk if isinstance(trunk, nn.Module) and trunk is not model else model


class ValueModel(nn.Module):
    """``V(s_t)`` for every position, from any Hugging Face causal LM used as a backbone.

    The head starts at zero, so a fresh critic predicts 0 everywhere and the first advantages
    are the returns themselves.
    """

    def __init__(self, backbone: nn.Module) -> None:
        """Wrap ``backbone``'s transformer (its LM head is dropped) with a value head.

        Args:
            backbone: a Hugging Face causal LM, or its bare transformer (``config.hidden_size``
                is read).
        """
        super().__init__()
        self.backbone = language_model_trunk(backbone)
        self.head = nn.Linear(self.backbone.config.hidden_size, 1)
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
            use_cache=False,
        )
        return self.head(out.last_hidden_state.float()).squeeze(-1)


def compute_values(
    critic: nn.Module, input_ids: Tensor, attention_mask: Tensor, response_mask: Tensor
) -> Tensor:
    """Values of the state before each response token.

    Args:
        critic: the value model (or its DistributedDataParallel wrapper).
        input_ids: ``[B, P + R]``.
        attention_mask: ``[B, P + R]``.
        response_mask: ``[B, R]``.

    Returns:
        ``[B, R]`` values, zero outside the mask.
    """
    r = response_mask.shape[1]
    v = critic(input_ids, attention_mask)[:, -r - 1 : -1]
    return v * response_mask.float()
