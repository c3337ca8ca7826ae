"""The measuring tools' own tests: the device suite's plumbing, its timer and floors, and
the accuracy claims (run by the README's test command with the package's)."""
