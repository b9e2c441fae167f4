"""Gin plumbing shared by the launchers: parse with checks, build the chosen driver."""
