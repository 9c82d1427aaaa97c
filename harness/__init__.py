"""The harness under the card's files: what the commands share (cli), the checkpoint format and the run
folder (checkpoint), train.py's settings (configurator), the optimisers (optim), the device, DDP, FLOPs
and MFU (machine). The model (mixer.py, attention.py) imports nothing of it; it stands on the model."""
