"""The corpus of damaged and hostile checkpoints in tests/data/hostile, which
the C++ runtime opens too (tests/unit/hostile_corpus_test.cpp): each case
raises the class cases.json names, in both, when every tensor and the common
state are read, and verify gives the status it names."""
import json
import os
import unittest

import distckpt

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "hostile")


def cases():
    with open(os.path.join(CORPUS, "cases.json")) as f:
        return json.load(f)


class HostileCorpus(unittest.TestCase):
    def test_every_case_raises_its_class(self):
        expected = cases()
        self.assertGreaterEqual(len(expected), 15)
        for name, want in sorted(expected.items()):
            with self.subTest(case=name):
                path = os.path.join(CORPUS, name)
                with self.assertRaises(distckpt.Error) as caught:
                    distckpt.load_plain_tensors(path)
                    distckpt.inspect(path)  # decodes the common state
                self.assertEqual(type(caught.exception).__name__, want["error"], str(caught.exception))
                # The class is the package's own export, catchable by name.
                self.assertIsInstance(caught.exception, getattr(distckpt, want["error"]))

    def test_verify_gives_each_case_its_status(self):
        for name, want in sorted(cases().items()):
            with self.subTest(case=name):
                report = distckpt.verify(os.path.join(CORPUS, name))
                self.assertEqual(report.status, want["verify"], report.problems)


if __name__ == "__main__":
    unittest.main()
