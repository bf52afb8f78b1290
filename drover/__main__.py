# `python -m drover` is the `drover` program: the same stdlib-only front as the console script (drover/front.py).
from drover.front import main

raise SystemExit(main())
