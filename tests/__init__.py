"""The tests are a package, laid out like src/specledger/ (tests/engine/ tests engine/, ...).

Being a package (every folder has an __init__.py) gives each test module a dotted name, so pytest puts only the
repository root on sys.path, two folders may hold files of the same name, and a test reaches a shared helper
or another test's fixtures by its full name (`from tests.support.fake_backend import SleepBackend`), with no sys.path
edits in any file. tests/e2e/ holds what checks the product as a whole (README, demo, import graph, peers).
"""
