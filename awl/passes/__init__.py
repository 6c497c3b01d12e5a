"""Delegation Passes: keys, the chain rules, JWS verification and issuing.

Above the store (keys, pass records and revocations live there), below the desk.
"""
