"""Helpers for the studio's pytest-qt tests (the `studio_window` fixture is in tests/conftest.py)."""


class Answers:
    """Stands in for the modal dialogs: records each question and gives a scripted answer."""

    def __init__(self, **answers):
        self.answers, self.asked = answers, []

    def __call__(self, kind, title, text):
        self.asked.append((kind, title, text))
        return self.answers.get(kind, "ok")
