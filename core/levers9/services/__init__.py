"""The application services: every operation of the controlplane and who may do it, whatever the transport.

REST, gRPC and the gateway translate to and from these modules; none of them
reaches into the scheduler or the SQL stores itself.
"""
