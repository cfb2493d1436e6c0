"""The text layer: token ids <-> text (the GGUF's tokenizer) and messages -> prompt (its chat template)."""

from openjet_launcher.text.chat import ChatTemplate, ChatTemplateError, RenderedPrompt
from openjet_launcher.text.tokenizer import StreamingDetokenizer, Tokenizer, TokenizerError, TokenizerWarning

__all__ = [
    "ChatTemplate",
    "ChatTemplateError",
    "RenderedPrompt",
    "StreamingDetokenizer",
    "Tokenizer",
    "TokenizerError",
    "TokenizerWarning",
]
