"""A minimal independent sender to a Claude Code session's inbox (claude-code-inbox.md §2), for bench/run's peer
row: the same auth line and envelope drover writes, no checks, no receipt socket.

    python bench/min_inbox_sender.py SESSIONS_DIR/PID.json TEXT
"""

import hashlib
import json
import os
import socket
import sys
import uuid

rec = json.load(open(sys.argv[1]))
path = rec["messagingSocketPath"]
key = os.path.join(os.path.dirname(sys.argv[1]), "{}.{}.key".format(rec["pid"], hashlib.sha256(path.encode()).hexdigest()))
token = json.load(open(key))["peerToken"]
body = f'<cross-session-message from-name="minimal" from-mode="prompting">\n{sys.argv[2]}\n</cross-session-message>'
msg = {"msgV": 1, "msg_id": str(uuid.uuid4()), "type": "user", "message": {"role": "user", "content": body}}
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
conn.connect(path)
conn.sendall((json.dumps({"type": "auth", "token": token}) + "\n" + json.dumps(msg) + "\n").encode())
conn.shutdown(socket.SHUT_WR)
while conn.recv(4096):  # the receiver never writes back: its close says it read the lines
    pass
