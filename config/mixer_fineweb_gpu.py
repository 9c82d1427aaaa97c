# The flat masked mixer of Badger 2024, "Masked Mixers for Language Generation and Retrieval"
# (arXiv 2409.01482), causal LM on FineWeb-edu (sample-10BT) in the setting of the paper's own code
# (blbadger/maskedmixers: mixer_lm/mixer_trainer_fineweb.py, the LanguageMixer(n_vocab, 1024, 16) line of
# its first version, and mixer_lm/mtp_mixer_fineweb.py, whose base model is the same): d_model 1024,
# 16 blocks, n_ctx 512, a BPE of 8,000 tokens trained on FineWeb-edu, 32 windows a step (one GPU, no
# accumulation), AdamW at learning rate 5e-4 after 500 warm-up steps, 200,000 steps (500,000 in the first
# version): 16 k tokens a step, 3.3 B tokens in all.
# Prepare it first (streams the dataset from the Hub; training tokens enough for every step to see new ones):
#   python data/prepare.py --dataset HuggingFaceFW/fineweb-edu --name sample-10BT --vocab_size 8000 --max_tokens 3300000000 --out data/fineweb_edu
# What differs from the paper's runs: its windows are documents padded or cut to 512 tokens, these are
# packed (documents back to back, <|endoftext|> between); its schedule decays linearly to 0, this one is
# this repository's cosine to min_lr; its mixed precision is fp16, here bf16 (dtype 'auto' on CUDA); its
# model has no final norm and untied embeddings, this one has this repository's defaults (as
# config/mixer_gpu.py); its validation is the first 50,000 documents, here 0.5% held out by a seeded rule.
# Measured here: nothing on a GPU, and no loss, speed or memory of this setting anywhere. Counted here (on
# the meta device, no GPU): 146.8 M parameters (155.0 M untied). The prepare command and train.py reading
# its folder ran here on CPU on small local corpora only (tests/test_corpus.py), not on FineWeb-edu, which
# this machine cannot reach.
variant = 'flat'
d_model = 1024
n_layer = 16
n_ctx = 512
batch_size = 32
grad_accum = 1
compile = True
max_iters = 200000
learning_rate = 5e-4
min_lr = 5e-5
warmup_iters = 500
eval_interval = 2000
eval_windows = 256
data_dir = 'data/fineweb_edu'
out_dir = 'out/mixer_fineweb_gpu'
