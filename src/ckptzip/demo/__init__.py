"""A real training run to show ckptzip on: a small GPT trained on the Python standard library.

`gpt` is the model, `data` the corpus, `train` the loop and the checkpointed state, `datasets`
the real checkpoints the benchmarks use, and `job` the `ckptzip demo` command.
"""
