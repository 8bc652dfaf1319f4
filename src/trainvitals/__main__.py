from trainvitals.cli import main

raise SystemExit(main())
