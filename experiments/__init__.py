"""The papers' questions, one file an experiment; run each from the repository root:

    python -m experiments.claims     the masked-mixer papers' claims at equal compute (claims_report: its tables)
    python -m experiments.icl        in-context regression (Vladymyrov et al. 2024) and masked mixers in context
    python -m experiments.represent  input representation accuracy (Badger 2024)
    python -m experiments.mqar       multi-query associative recall (Arora et al. 2023, "Zoology") for every kind
    python -m experiments.bench      throughput, memory, generation and decode-speed tables
    python -m experiments.convert    the paper's trained models in, any checkpoint out as safetensors
    python -m experiments.compare    any training runs side by side: their curves and a table, from their log.jsonl
                                     (run_log: a run's log read, seeds as groups)

runner.py is the job pool under claims, icl and mqar. Nothing in the core (mixer.py, train.py,
sample.py, retrieval.py) imports from here.
"""
