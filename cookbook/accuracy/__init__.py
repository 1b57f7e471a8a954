"""Task accuracy through lm-eval (no harness of the cookbook's own): lm-eval's environment built once in the cache
(`env`), the cookbook's own offline tasks generated from a seed (`tasks`), and running lm-eval and reading its
per-item results (`run`). The check itself is `cookbook.checks.accuracy`."""
