"""Model cards and Hub publishing."""

from .model_card import realm_model_card

__all__ = ["realm_model_card"]
