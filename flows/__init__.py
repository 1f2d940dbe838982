"""flows: the product's flows, below the front door (app/) and above the packages they wire: the
DAG steps (`pipeline.py`), the main job's flow (`main_job.py`, what `make run` runs), the stream
(`stream.py`), the jobs' and the stream's metrics files, the project's Airflow environment
(`airflow_env.py`), and the fleet that reacts (`follow.py`)."""
