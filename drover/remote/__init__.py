"""drover's remote side: the small stdlib-only modules that do a host's work (Python 3.6+).

Locally they import as `drover.remote`; over SSH they travel as one compressed bundle (drover/transport/bundle.py)
and import as `drover_remote` through a tiny in-memory importer, so nothing is written on the host.  Modules
import each other relatively, so either name works.

    protocol     the version, outcome names and every error code
    profiles     engine profiles: how each engine looks in the process tree and on screen
    screen       classifying a captured screen: idle, busy, dialog, unknown
    text         neutralising control characters; the envelope
    procs        the process table, engine detection, process identity
    tmux         tmux servers, panes, and the commands the lanes need
    claude       Claude Code's session registry, liveness, permission class
    discovery    every session on the host, and naming one
    delivery     one message: lane choice, declared class, envelope
    inbox        Claude Code's inbox lane
    tmux_lane    the guarded paste
    wait         waiting for idle or exit, on the host
    transcripts  Claude transcripts and Codex rollouts, filtered
    main         answering requests: the op table and the framed answers
"""
