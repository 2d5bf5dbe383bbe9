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
