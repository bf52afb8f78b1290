"""Code the tests share and are not tests: the labs that run the real agents, the fakes beside them, the sshd fleet."""
