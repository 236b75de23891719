"""`python -m loadtest.fake_upstream`: the fake OpenAI upstream (see docs/fake_upstream.md)."""

from proxy.fake_upstream import main

if __name__ == "__main__":
    main()
