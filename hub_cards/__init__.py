"""Model cards and Hub publishing."""

from .model_card import open_qa_model_card, realm_model_card

__all__ = ["open_qa_model_card", "realm_model_card"]
