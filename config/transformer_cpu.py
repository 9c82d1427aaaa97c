# The llama-style transformer (Badger 2024, "Masked Mixers for Language Generation and
# Retrieval", arXiv 2409.01482, the papers' baseline: RoPE, SwiGLU, RMSNorm) at the
# shape of config/tinystories_cpu.py, so the two compare on 2 CPU cores in about the
# same time: the same settings with variant 'transformer' (4 heads) and no
# mixing_lr_mult (a transformer has no token-mixing matrices).
# Reported loss: the paper ran no CPU-scale model; compare with tinystories_cpu.py's
# 2.879 nats (README, "Results"), not with the paper.
variant = 'transformer'
d_model = 128
n_layer = 4
n_ctx = 256
batch_size = 8
max_iters = 3400
learning_rate = 5e-3
beta2 = 0.99
min_lr = 3e-4
warmup_iters = 100
eval_interval = 500
out_dir = 'out/transformer_cpu'
