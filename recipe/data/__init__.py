"""Data: the byte or Hugging Face tokenizer, the document sources (local files, Hugging Face datasets,
synthetic text) and the packed, resumable loader."""
