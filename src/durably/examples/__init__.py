"""Example agents bundled with durably.

`durably.examples.support_desk` is the agent `durably dev` hosts: it runs
offline (a scripted model) and shows an approval and both retrying recovery
policies::

    durably worker --agents durably.examples.support_desk:registrations
"""
