"""Backends run one request (one turn) and report when each token arrived (base.py; make.py picks one)."""
