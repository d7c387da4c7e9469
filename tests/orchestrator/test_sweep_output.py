"""What `bcrit sweep` points a user at when it ends."""


def test_parent_run_page_opens_the_model_training_view(tmp_path):
    import json

    from orchestrator.cli.sweep_cmd import parent_run_page

    assert parent_run_page(str(tmp_path)) is None
    (tmp_path / "mlflow_parent.json").write_text(json.dumps({"experiment_id": "3", "run_id": "abc"}))
    assert parent_run_page(str(tmp_path)) == (
        "http://127.0.0.1:5000/#/experiments/3/runs/abc?workflowType=machine_learning"
    )
