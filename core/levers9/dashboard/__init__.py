"""The web dashboard: server-rendered pages over the service layer, and signing people in."""
