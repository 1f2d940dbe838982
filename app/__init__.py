"""app: the application on top of the layers: the `ccs` CLI, the pipeline steps, `make run`, Airflow wiring, notebook helpers."""
