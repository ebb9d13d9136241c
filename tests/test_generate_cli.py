"""The main job: AR and JETSPEC side by side, printed and written as JSON."""


def test_generate_reports_both_modes_side_by_side(jetspec_report, capsys):
    report = jetspec_report(
        "generate",
        "--head",
        "untrained",
        "--num-prompts",
        "2",
        "--max-new-tokens",
        "8",
        "--budget",
        "8",
        "--dtype",
        "fp32",
    )
    for mode in ("autoregressive", "jetspec"):
        figures = report[mode]
        assert figures["tokens"] == 16 and figures["requests"] == 2
        assert figures["tokens_per_s"] > 0 and figures["seconds"] > 0
    assert report["autoregressive"]["mean_accept_length"] == 1.0
    # an untrained head and no repeats: about 1 (1.0 measured). Had the autoregressive answers leaked into
    # the hybrid drafter's store of finished outputs (one engine for both runs), the answers would be
    # drafted whole (3.5 measured)
    assert report["jetspec"]["budget"] == 8 and 1.0 <= report["jetspec"]["mean_accept_length"] < 2
    assert report["greedy_outputs_differing"] == 0 and report["greedy_divergences"] == []
    assert report["device"].endswith("fp32 (requested)")
    assert abs(report["speedup"] - report["jetspec"]["tokens_per_s"] / report["autoregressive"]["tokens_per_s"]) < 1e-9
    printed = capsys.readouterr().out
    # the default drafter is the hybrid (head tree + lookups), said in the row and the head line
    assert (
        report["jetspec"]["mode"] == "hybrid"
        and "prompt lookup + draft corpus of 0 tokens + finished outputs (hybrid" in report["head"]
    )
    assert "autoregressive" in printed and "hybrid" in printed and "speedup" in printed and "untrained head" in printed
