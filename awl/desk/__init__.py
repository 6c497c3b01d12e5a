"""The desk: commands, queries and waiting over a store; effects, track records, briefings.

Above documents, store and passes; below the gateway and the servers.
"""
