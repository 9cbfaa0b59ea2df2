"""The class poll: students answer the lesson's predict questions on their phones, the projector shows the class's answers.

    store.py     the rules, in SQLite (codes, the teacher's key, one answer per device per question, expiry)
    student.py   what a phone may see, and the phone page (plain HTML + a few lines of script)
    routes.py    /poll, /poll/<code>, its state and answer endpoints (served by the app's own server)
    teacher.py   the projector's side: a panel in the lesson (start, code + QR, live counts, reveal, close, next, end)
    charts.py    the class's answers as HTML bars and the summary (pure functions)
    load_bench.py  `python -m app.poll.load_bench`: 30 students while the model decodes (docs/benchmarks.md)
"""
