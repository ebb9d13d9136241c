"""Operations files (rules, dashboard, collector, manifests, runbook) and the metric catalogue generator."""
