"""Bots reached by signed webhook (issue 21, part 2): `[bots.NAME]` config, the signed send (`deliver.py`, the
seam drover/ops/endpoints.py imports), the reply listener (`callback.py`), and replies wrapped as data
(`untrusted.py`)."""
