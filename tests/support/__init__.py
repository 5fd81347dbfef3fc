"""Helpers for tests: a Chrome DevTools Protocol client and the UI screenshot."""
