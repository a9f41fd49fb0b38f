"""Test helpers: a loopback OpenAI-compatible server and small model builders."""
