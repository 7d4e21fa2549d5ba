"""Helpers shared by the test tiers: processes, clients, certificates, fakes and factories.

Test modules import helpers from here (or from their own folder), never from another test module.
"""
