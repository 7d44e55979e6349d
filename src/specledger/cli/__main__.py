"""`python -m specledger.cli`: the same command as the `specledger` console script."""

from specledger.cli import main

main()
