"""Hugging Face weights in and out: importing a Llama folder, the exported config and tokenizer files, the
exporter."""
