"""The lab: how the shipped models were trained (`packed_ss.lab.train`) and how the decoders are measured
(`packed_ss.lab.bench`).

Nothing in decoding imports the lab (tests/test_layout.py checks it); the `bench` and `bench-any-order`
subcommands of `python -m packed_ss` import it only when they run.
"""
