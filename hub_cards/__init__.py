"""Model cards and Hub publishing."""

from .model_card import openqa_model_card, realm_model_card
from .space_app import write_space_app

__all__ = ["openqa_model_card", "realm_model_card", "write_space_app"]
