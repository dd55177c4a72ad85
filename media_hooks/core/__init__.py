"""The ground floor: settings read from the environment, the numbers and identifiers users
give (checked in one place, one clear error each), the two kinds of failure a user sees, the
retry backoff, the CPU a delivery's threads run on, and the named crash points the failure
tests use. Imports nothing of the package.
"""
