# `python -m drover` is the `drover` program: the same stdlib-only front as the console script (drover/fast.py).
from drover.fast import main

raise SystemExit(main())
