"""A minimal Django project for benchmarks/django_tasks.py: one no-op task, on durablesched's
backend or django-tasks-db's, as ``BENCH_BACKEND`` says."""
