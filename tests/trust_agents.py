"""The coordinator tests/test_delegation_trust.py serves: it asks ``credit-bureau`` (found
through the registry) for a score and says the score, or the error it got."""

from __future__ import annotations

from mesh import Agent, Rule, Script, remote
from mesh._models.scripted import Call
from mesh._resilience import RetryPolicy

officer = Agent(
    name="test-officer",
    instruction="Score applicants through the credit bureau.",
    tools=[
        remote(
            "credit-bureau",
            skill="score",
            deadline_s=10.0,
            policy=RetryPolicy(attempts=4, initial_delay=0.05, max_delay=0.2),
        )
    ],
    script=Script(
        rules=[
            Rule(
                when=r"score (?P<applicant_id>APP-\d+)",
                steps=[
                    [
                        Call(
                            "credit_bureau_score",
                            {"applicant_id": "{applicant_id}", "amount": 1000},
                        )
                    ]
                ],
                answer="score {credit_bureau_score.score}",
                on_error="no score: {error}",
            )
        ],
        fallback="Ask: score APP-501",
    ),
)
