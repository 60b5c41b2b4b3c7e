"""``python -m fuzz``: fuzz the readers by hand, for longer than the test suite does.

>>> # python -m fuzz --reader npy --runs 100000
"""

from fuzz.cli import main

raise SystemExit(main())
