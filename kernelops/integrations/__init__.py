"""Integrations of kernelops with other libraries. Each submodule imports its library on import,
so importing ``kernelops.integrations`` itself imports none of them.

* :mod:`kernelops.integrations.transformers`: an ``attn_implementation="kernelops"`` for Hugging
  Face transformers models (Llama, Qwen, Mistral, Gemma 2, BERT, ...).

>>> from kernelops.integrations import transformers as hf_kernelops   # doctest: +SKIP
>>> hf_kernelops.register()                                           # doctest: +SKIP
'kernelops'
"""
