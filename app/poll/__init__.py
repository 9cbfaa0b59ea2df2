"""The class poll: students answer the lesson's predict questions on their phones, the projector shows the class's answers.

    store.py     the rules, in SQLite (codes, the teacher's key, one answer per device per question, expiry)
    student.py   what a phone may see, and the phone page (plain HTML + a few lines of script)
    routes.py    /poll, /poll/<code>, its state and answer endpoints (served by the app's own server)
    charts.py    the class's answers as HTML bars and the summary (pure functions)

The projector's side is a panel of the lesson (app/lesson/poll_panel.py: start, code + QR, live counts, reveal,
close, next, end) and the load benchmark a developer tool (`python -m app.dev.poll_load`): this package imports
neither the lesson nor the dev tools.
"""
