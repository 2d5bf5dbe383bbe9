"""The `ray job submit` scripts' main: a run folder inside Ray's temporary copy of the working dir is
refused (it would be lost), and the job says where its run folder is."""

from pathlib import Path

from vlm_decade import job


def test_a_run_folder_inside_the_job_package_is_refused(tmp_path, monkeypatch, capsys):
    package = tmp_path / "session" / "runtime_resources" / "working_dir_files" / "_ray_pkg_0123"
    package.mkdir(parents=True)
    monkeypatch.chdir(package)
    assert job.main("decade", "test", ["--demo", "--out", "runs/here"]) == 2
    err = capsys.readouterr().err
    assert "would land inside Ray's temporary copy of the working dir" in err and str(package) in err
    assert not (package / "runs").exists()


def test_job_package_only_inside_a_ray_working_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert job.job_package(Path("runs/x")) is None
    package = tmp_path / "runtime_resources" / "working_dir_files" / "_ray_pkg_1"
    package.mkdir(parents=True)
    monkeypatch.chdir(package)
    assert job.job_package(Path("runs/x")) == package.resolve()
    assert job.job_package(tmp_path / "elsewhere") is None  # an absolute path outside is fine


def test_a_job_whose_run_left_failed_rows_exits_3_unless_allowed(tmp_path, monkeypatch, capsys):
    """The job ends as `vlm-decade run` does: the per-model summary, then 3 (0 with --allow-failures)."""
    from dataclasses import asdict
    from types import SimpleNamespace

    from vlm_decade import studies
    from vlm_decade.core.runfolder import RunFolder
    from vlm_decade.core.runner import Failed

    folder = RunFolder(tmp_path / "run")
    failed = Failed("responses", "ssd", 3, 4, "ValueError: no weights", 3)
    folder.update_manifest(pipeline=["responses"], stages={"responses": {"failed": [asdict(failed)]}})
    monkeypatch.setattr(job, "_study", lambda kind, args: SimpleNamespace(output=str(folder.root)))
    monkeypatch.setattr(studies, "pipeline_of", lambda study: SimpleNamespace(run=lambda study: folder))
    assert job.main("decade", "test", ["--demo"]) == 3
    said = capsys.readouterr().err
    assert "exit status 3" in said and "ssd: 3 of 4 responses failed; most common (3): ValueError: no weights" in said
    assert job.main("decade", "test", ["--demo", "--allow-failures"]) == 0
    assert "exit status 0" in capsys.readouterr().err
    folder.update_manifest(stages={"responses": {}})  # nothing failed: 0
    assert job.main("decade", "test", ["--demo"]) == 0
